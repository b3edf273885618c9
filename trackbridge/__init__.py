"""trackbridge: translate, multiplex, migrate and compare RL fine-tuning metrics."""
__version__ = "0.1.0"
