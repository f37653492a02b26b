"""The core: pure decision logic and the one coordinator (no HTTP, no SQL, no torch).

* :mod:`.detectors` — Observation -> Decision rules and their registry;
* :mod:`.records` — the typed records that cross every boundary;
* :mod:`.lifecycle`, :mod:`.registry` — the state-machine and registry patterns used everywhere;
* :mod:`.store` — the store interface (implementations live in :mod:`evalstop_trl.stores`);
* :mod:`.tenants` — tenants and tokens; :mod:`.coordinator` — decide → transition → commit;
* :mod:`.errors` — the exception hierarchy.
"""
