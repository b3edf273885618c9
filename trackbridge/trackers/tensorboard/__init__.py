"""The tensorboard tracker: its storage format, sink and source."""
