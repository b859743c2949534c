"""The public face (docs/api.md): apply / revert / applied / status, manifest(), the
MEGATRON_BACKPORTS* switches, one name per thing, and the machinery's reliability."""
