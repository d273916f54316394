"""The paper recipes: the four translation tasks of Correia et al. (2019), Table 1."""
