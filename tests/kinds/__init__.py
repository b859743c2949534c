"""backports/megatron/kinds/: target kinds, the installer's alias scan (install.py), targets
that move, are decorated or span several modules."""
