"""The trackio tracker: its storage format, sink and source."""
