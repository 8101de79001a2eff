"""A spec's YAML, parsed safely and without aliases: `yaml.safe_load` shares an aliased node, but a spec is
expanded to text (its canonical text, its version's hash), so a few hundred bytes of nested aliases became
gigabytes and minutes of work in whatever loads the spec (the DAG processor lists every spec)."""
from __future__ import annotations

import yaml


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"an alias (*{event.anchor}) is not allowed in a spec: write the value out",
                event.start_mark)
        return super().compose_node(parent, index)


def load_yaml(text: str) -> object:
    """The document, as yaml.safe_load gives it; yaml.YAMLError for an alias."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader
