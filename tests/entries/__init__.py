"""One file per catalog entry (test_megatron_lm_<PR>.py), #7617's vendored function, its
local changes and the kernel boundary."""
