"""``python -m backports.megatron``: the ``backports`` command."""

from .cli import console

if __name__ == "__main__":
    console()
