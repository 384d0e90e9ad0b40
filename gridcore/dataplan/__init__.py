"""Data-driven batch pipelines (Bent et al., DADC 2009) above the simulator: the file
format (:mod:`~gridcore.dataplan.format`), planning it on a grid's sites
(:mod:`~gridcore.dataplan.planning`, with the simulation chooser of
:mod:`~gridcore.dataplan.choosers`) and the live measurement
(:mod:`~gridcore.dataplan.live`). The policy is :mod:`gridcore.policies.dataplan` and
:mod:`gridcore.policies.dataplan_stages`; the simulator model :mod:`gridcore.sim.dataplan`;
the live engine :mod:`gridcore.engine.dataplan`."""
