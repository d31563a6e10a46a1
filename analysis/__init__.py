"""Task-vector statistics for RAM: densities, overlaps, ρ_t and λ_t, from one streaming pass."""
