"""One folder per tracker: its storage format, its sink, its source."""
