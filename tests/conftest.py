"""Load the hazards pytest plugin when the package is not installed (its pytest11 entry point does otherwise)."""
import importlib.metadata
import os

if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not any(
        ep.value == "hazards.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11")):
    pytest_plugins = ["hazards.pytest_plugin"]
