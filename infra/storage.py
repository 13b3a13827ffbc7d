"""The results bucket both backends keep exports and checkpoints in."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from .settings import Settings


def results_bucket(settings: Settings, labels: dict[str, str], opts: pulumi.ResourceOptions) -> gcp.storage.Bucket:
    """Private to the project (uniform access, public access prevented), in the zone's region.

    `pulumi destroy` refuses to delete it while it holds objects: finished exports are never lost.
    """
    return gcp.storage.Bucket(
        "results",
        name=settings.results_bucket,
        location=settings.region.upper(),
        uniform_bucket_level_access=True,
        public_access_prevention="enforced",
        labels=labels,
        opts=opts,
    )


# What a job writing checkpoints and exports needs on the bucket, and nothing outside it: objects, and
# storage.buckets.get, which MaxText calls before it saves to gs:// (utils/gcs_utils.py
# mkdir_and_check_permissions); objectAdmin alone gives a misleading "bucket not found".
BUCKET_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")
