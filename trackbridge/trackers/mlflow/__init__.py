"""The mlflow tracker: its storage format, sink and source."""
