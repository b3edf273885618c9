"""The jsonl tracker: its storage format, sink and source."""
