"""backports/megatron/decision/: judging (early evidence, sniffs), the verdict cache and the
proof store, the one rule for ``upstream``."""
