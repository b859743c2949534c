"""backports/megatron/sync/ (``backports sync``, tools/sync_upstream.py): the upstream each
test builds is upstreams.py's, the fixtures conftest.py's."""
