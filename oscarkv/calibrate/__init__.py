"""Offline calibration: hooks stream attention statistics → solve rotations and clips → artifact.

``stats`` gathers second moments inside the forward pass, ``solve`` turns them into rotations,
means and per-layer clips, ``run`` drives both and builds the
:class:`~oscarkv.quant.artifact.Artifact` that ``oscarkv calibrate`` writes and serving loads.
"""

from oscarkv.calibrate.run import calibrate, format_summary

__all__ = ["calibrate", "format_summary"]
