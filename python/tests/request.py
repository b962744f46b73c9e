"""Asks for a transparent checkpoint: prints what request_checkpoint() gave
(``committed``, ``restored``) or the error code outside ``stasis run``."""
import stasis

try:
    print("restored" if stasis.request_checkpoint() else "committed", flush=True)
except stasis.StasisError as e:
    print(f"error {e.code}", flush=True)
