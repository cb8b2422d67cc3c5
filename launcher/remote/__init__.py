"""Checkpoints off the cluster (docs/checkpoints.md#in-a-bucket): every complete checkpoint copied to S3-compatible
object storage by the job's supervisor, in the background; a run resumed from the bucket where its checkpoints
folder has nothing as new; the bucket's own retention; the launcher's exports and eval jobs reading a step that is
only there. One package, its modules at the levels they serve: the job's side (settings, client, marker, bucket,
multipart, upload, fetch, record) stands on the standard library, held so by an import contract per module."""
