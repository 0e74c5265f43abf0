"""What test doubles of `app.backends.base.Backend` share."""

from __future__ import annotations


class FakeTunables:
    """The Backend ABC's tunables, kept per kernel against its record, as a real backend keeps them: a
    double mixes this in before `Backend` and gets validated `set_tunables` for free."""

    def _tunable_store(self) -> dict[str, dict]:
        return self.__dict__.setdefault("_tunable_values", {})

    def tunables(self) -> dict:
        return self.record(self.kernel).with_tunables(self._tunable_store().get(self.kernel, {}))

    def set_tunables(self, **values) -> None:
        checked = self.record(self.kernel).validate_tunables(values)
        store = self._tunable_store()
        store[self.kernel] = {**store.get(self.kernel, {}), **checked}

    def clear_tunables(self) -> None:
        self._tunable_store().clear()
