"""Authoring backports: deriving a plugin from an upstream pull request (``from_pr``)."""
