from mtpx.spec_decode.multi_module import MultiModuleMTPSpeculator
from mtpx.spec_decode.single_module import SingleModuleMTPSpeculator

SPECULATORS = {"mtp1": SingleModuleMTPSpeculator, "mtp8": MultiModuleMTPSpeculator}


def build_speculator(method: str | None, model, num_speculative_tokens: int | None):
    """method: None (plain decoding), "mtp1" (single-module) or "mtp8" (multi-module);
    num_speculative_tokens 0 is plain decoding too (so a sweep over k can include it). Raises
    ValueError naming the choices for an unknown method."""
    if method is None or (num_speculative_tokens == 0 and not isinstance(num_speculative_tokens, bool)):
        return None
    if method not in SPECULATORS:
        raise ValueError(f"unknown spec '{method}': choose one of {sorted(SPECULATORS)} (+spec=NAME) "
                         "or no spec for plain decoding")
    return SPECULATORS[method](model, num_speculative_tokens)


__all__ = ["MultiModuleMTPSpeculator", "SingleModuleMTPSpeculator", "build_speculator", "SPECULATORS"]
