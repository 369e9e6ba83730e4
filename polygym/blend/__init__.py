"""Multi-environment mixes: the blend spec, the step planner, the step sampler and stepwise collection."""
