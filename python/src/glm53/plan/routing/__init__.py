"""Routing statistics: the trace and counts formats, synthetic traces and their named shapes, public captures of
real routing. Reads only `glm53.plan.inputs`."""
