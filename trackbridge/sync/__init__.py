"""Keeping a tracker in step with a run's canonical stream, whatever it missed (an outage, a kill, a tracker added
later): :mod:`.holdings` (what a tracker already holds, per key, read back from it), :mod:`.catchup` (writing what it
lacks, in batches: the logger, ``replay``, ``migrate`` and ``compare --into``) and :mod:`.replay` (a spool into a
tracker, the ``replay`` command). The three serve different layers (the logger's core, the trackers' catch-up, the
command line's edge), so this ``__init__`` imports nothing: import the module you need.
"""
