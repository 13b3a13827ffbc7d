"""Stand-in for maxtext.checkpoint_conversion.to_maxtext: its log lines and its output layout."""

import time

from maxtext import _standin

PARAMS = 12  # scanned Llama parameters, as the real bar counts them


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    started = time.time()
    _standin.flood()
    _standin.python_log("Lazy loading DISABLED. Loading full HuggingFace model: meta-llama/Llama-3.1-8B-Instruct...")
    _standin.pause()
    _standin.bar("Transforming weights: ", PARAMS)
    _standin.maybe_fail("to_maxtext")
    out = args["base_output_directory"].rstrip("/")
    for name in ("manifest.ocdbt", "_METADATA", "_sharding", "commit_success.txt"):
        _standin.write(f"{out}/0/items/{name}", b"standin checkpoint\n")
    for name in ("_CHECKPOINT_METADATA", "commit_success.txt"):
        _standin.write(f"{out}/0/{name}", b"{}\n")
    _standin.python_log("saved a checkpoint at step 0")
    _standin.python_log(f"Conversion complete. Checkpoint saved to {out}")
    _standin.python_log(f"Overall Elapse: {(time.time() - started) / 60:.2f} min")
    _standin.python_log("Peak Memory: 0.10 GB")


if __name__ == "__main__":
    main()
