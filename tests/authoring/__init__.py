"""backports/megatron/authoring/: ``backports new`` (scaffold), ``--from-pr`` and
``backports candidates``; a plugin installed for real."""
