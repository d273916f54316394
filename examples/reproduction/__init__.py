"""The reduced-scale reproduction of Correia et al. (2019) on data that fits a CPU."""
