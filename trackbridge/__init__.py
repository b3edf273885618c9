"""trackbridge: translate, multiplex, migrate and compare RL fine-tuning metrics."""
__version__ = "0.1.0"

from .logger import NoOpRun, Run, init  # noqa: E402  (standard library only; trackers load lazily)
from .translate import Translation, Translator, translate  # noqa: E402
from .integrations import unwrap, wrap  # noqa: E402  (standard library only; the wrapped tracker loads on use)

__all__ = ["__version__", "init", "Run", "NoOpRun", "translate", "Translator", "Translation", "wrap", "unwrap"]
