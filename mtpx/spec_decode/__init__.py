from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator

SPECULATORS = {"mtp1": SingleModuleMTPSpeculator, "mtp8": MultiModuleMTPSpeculator}


def build_speculator(method: str | None, model, num_speculative_tokens: int | None):
    """method: None (plain decoding), "mtp1" (single-module) or "mtp8" (multi-module).
    Raises ValueError naming the choices for an unknown method."""
    if method is None:
        return None
    if method not in SPECULATORS:
        raise ValueError(f"unknown spec '{method}': choose one of {sorted(SPECULATORS)} (+spec=NAME) "
                         "or no spec for plain decoding")
    return SPECULATORS[method](model, num_speculative_tokens)


__all__ = ["MultiModuleMTPSpeculator", "SingleModuleMTPSpeculator", "build_speculator", "SPECULATORS"]
