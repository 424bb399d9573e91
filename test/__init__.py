"""Flide's test suite, one folder per package folder of ``flide_ext`` (shared helpers in
``test.helpers``). Every folder is a package, so pytest imports each test module by its
full name (``test.kernels.test_rotary``) from the repository root."""
