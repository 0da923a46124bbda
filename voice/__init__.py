"""voice: a hands-free voice assistant that really stops when you talk over it."""

__version__ = "0.1.0"
