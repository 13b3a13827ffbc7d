"""Stand-in for maxtext.checkpoint_conversion.to_maxtext: its log lines and its output layout."""

import os
import time

from maxtext import _standin

LAYERS = 12


def main() -> None:
    args = _standin.args()
    _standin.require_token()
    started = time.time()
    _standin.flood()
    for done in range(1, LAYERS + 1):
        _standin.pause()
        percent = done * 100 // LAYERS
        _standin.log(f"Transforming weights: {percent:3d}%| | {done}/{LAYERS} [00:0{done % 10}<00:00, 1.00it/s]")
    _standin.maybe_fail("to_maxtext")
    items = os.path.join(args["base_output_directory"], "0", "items")
    os.makedirs(items, exist_ok=True)
    with open(os.path.join(items, "manifest.ocdbt"), "w") as f:
        f.write("standin checkpoint\n")
    _standin.log(f"Conversion complete. Checkpoint saved to {args['base_output_directory']}")
    _standin.log(f"Overall Elapse: {(time.time() - started) / 60:.2f} min")
    _standin.log("Peak Memory: 0.10 GB")


if __name__ == "__main__":
    main()
