"""Static hazard checks on CPU: inline-asm source lint, AMDGCN and SASS checks on real
compiler output, and the barrier layout checker. Entry point: `runner.run_static_checks`."""
