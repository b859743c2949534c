"""What one interpreter offers every part of the tool: the one ``sys.meta_path`` finder that
runs code around and after a watched module's execution (``import_hooks``), and saying a
thing once per job rather than once per process (``once_per_job``). Standard library only,
and cheap to import: the start-up path loads them before anything of megatron."""
