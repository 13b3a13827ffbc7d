"""What a chip-hour costs, as the user pays it: by chip, provisioning model and region, from public list prices.

Prices change: each is said with its date and source, and `vm.price_per_chip_hour` overrides them all. Sources:
SkyPilot's public catalog (skypilot-org/skypilot-catalog, catalogs/v8/gcp/vms.csv, rows tpu-v6e-* and
tpu-v5litepod-*) for on-demand and Spot by region; Google's Trillium GA announcement (2024-12-12) for v6e's 1- and
3-year commitments.
"""

from __future__ import annotations

from dataclasses import dataclass

AS_OF = "list prices of 2026-12-04"
DEFAULT_REGION = "us-east5"  # the README's zone (us-east5-b): where a plan without a stack is priced
_US = ("us-central1", "us-east1", "us-east4", "us-east5", "us-south1", "us-west1")
ON_DEMAND = {
    "v6e": {**dict.fromkeys(_US, 2.70), "europe-west4": 2.97, "asia-southeast1": 2.97, "asia-northeast1": 3.24,
            "asia-south1": 3.24},
    "v5e": {**dict.fromkeys(("us-central1", "us-east1", "us-east4", "us-east5", "us-west1", "us-west4"), 1.20),
            "us-south1": 1.416, "europe-west4": 1.56},
}  # fmt: skip
SPOT = {
    "v6e": {"us-central1": 0.544, "us-east1": 0.544, "us-west1": 0.544, "us-east4": 0.578, "us-east5": 1.215,
            "us-south1": 1.35, "europe-west4": 1.037},
    "v5e": {"us-central1": 0.245, "us-east1": 0.245, "us-west1": 0.245, "us-west4": 0.48, "us-east4": 0.60,
            "us-east5": 0.60},
}  # fmt: skip
COMMITTED = {"v6e": {"1-year": 1.89, "3-year": 1.22}}


@dataclass(frozen=True)
class Price:
    """A chip-hour's price and where it comes from; `note`: what else the user should know (prepaid, alternatives)."""

    per_chip_hour: float | None
    source: str
    note: str = ""


def region_of(zone: str | None) -> str | None:
    """us-east5-b -> us-east5."""
    return zone.rsplit("-", 1)[0] if zone and zone.count("-") >= 2 else None


def price(chip: str | None, provisioning: str | None, zone: str | None, override: float | None) -> Price:
    """The chip-hour's price for this stack (`provisioning` None: no stack was read; the default machine priced on
    demand and said so)."""
    if override is not None:
        return Price(override, "vm.price_per_chip_hour")
    if chip not in ON_DEMAND:
        return Price(None, "no list price for this machine: set vm.price_per_chip_hour")
    region = region_of(zone) or DEFAULT_REGION
    where = f"{chip} in {region}" + ("" if zone else " (no stack read: pass --stack STACK for yours)")
    on_demand = ON_DEMAND[chip].get(region)
    committed = COMMITTED.get(chip, {})
    alternatives = ", ".join(f"{term} ${cost:.2f}" for term, cost in committed.items())
    if provisioning == "SPOT":
        spot = SPOT[chip].get(region)
        if spot is None:
            return Price(None, f"no Spot list price for {where}: set vm.price_per_chip_hour")
        return Price(
            spot, f"Spot, {where}, {AS_OF}; Spot prices change", "Spot is preemptible: a preemption deletes the VM"
        )
    if on_demand is None:
        return Price(None, f"no list price for {where}: set vm.price_per_chip_hour")
    if provisioning == "RESERVATION_BOUND":
        return Price(
            on_demand,
            f"the on-demand equivalent, {where}, {AS_OF}",
            "a reservation is prepaid: billed while it exists, used or not"
            + (f" (set vm.price_per_chip_hour to your rate; committed use: {alternatives})" if alternatives else ""),
        )
    model = "on demand" if provisioning in (None, "STANDARD") else f"{provisioning} (billed as on demand, at most)"
    note = f"with a committed-use discount: {alternatives} a chip-hour (set vm.price_per_chip_hour)"
    return Price(on_demand, f"{model}, {where}, {AS_OF}", note if alternatives else "")
