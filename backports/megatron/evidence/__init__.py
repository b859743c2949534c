"""What the environment says before any target is judged: installed versions (read without
importing), git ancestry of a source checkout, file fingerprints, and the one look per call
that keeps those reads from repeating. Standard library and ``packaging`` only; nothing here
knows a backport."""
