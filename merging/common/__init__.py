"""What every stage shares: errors, escaping, bounded parsers, dtypes, units, the compute device, threads, the
package's version."""
