"""Static hazard checks on CPU: source lint, AMDGCN and SASS checks of compiler output, layouts.

Every check id is registered in `checks`; `runner.check_paths` runs the checks a user's
paths need. This package checks artifacts and imports nothing from the catalog: the
catalog's verdicts on its own variants are `hazards.static_catalog`.
"""
