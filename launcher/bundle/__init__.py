"""The reproducibility bundle: the nanotron config and the sbatch script rendered from a resolved spec (pure
functions, `render`), the files written whole and never overwritten (`files`), the manifest (`manifest`), and the
room they need on disk (`storage`)."""
