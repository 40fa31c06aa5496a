"""aspan: study why transformers fail to extrapolate, by looking at and editing their attention."""
__version__ = "0.1.0"
