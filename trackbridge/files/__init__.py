"""Readers of file formats that are not trackers: nothing writes them, trackbridge only reads them (``migrate``,
``translate``, ``detect``, ``compare``). Each is a source of its own kind, registered in :mod:`trackbridge.trackers`
without a sink:

* ``csv:PATH`` (:mod:`~trackbridge.files.csv`): a wandb CSV export or any table of steps and values;
* ``trainer-state:PATH`` (:mod:`~trackbridge.files.trainer_state`): transformers' ``trainer_state.json``;
* ``console:PATH`` (:mod:`~trackbridge.files.console`): veRL's ``step:N - key:value`` lines and printed dicts;
* :mod:`~trackbridge.files.printed`: printed numbers and dicts read without ``eval`` (shared by the two above).

They build on :mod:`trackbridge.tracking` (the reader interface, text-file helpers) like the trackers' readers do,
and import no tracker.
"""
