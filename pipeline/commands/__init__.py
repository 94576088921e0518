"""Sub-commands of ``prism-pipeline``; each module exposes ``register(subparsers)``."""
