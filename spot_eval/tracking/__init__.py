"""MLflow tracking: writing runs, spooling them through an outage, and replaying the spool.

- `writer.py`: `open_tracker` / `Tracker`: one parent run per evaluation, nested runs per method.
- `spool.py`: the journal every tracking call is mirrored into, kept only after an outage.
- `store.py`: reaching a store (URIs, the health check, fast-failing client calls).
- `sync.py`: `spot-eval sync`, replaying spooled runs into the store.

Reading runs back into reports lives in `spot_eval.reports.history`. This subpackage imports
nothing of spot_eval outside itself; mlflow is imported here and in reports.history only.
"""
