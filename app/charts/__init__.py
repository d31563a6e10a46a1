"""Plotly figure builders (pure: frames in, figures out), the palettes, and `show` (theme, title, downloads),
one module per chart family. Pages use `from app import charts` and `charts.NAME`: every public name is here."""
from __future__ import annotations

from .base import (AGENT_PALETTE, TOY_PALETTE, OVERLAP_COLORS, UNIQUE_COLOR, SHARED_COLOR, UNIQUE_TEXT, NEUTRAL,
                   FONT, THEMES, TEMPLATES, FIG_FORMAT_KEY, FIG_FORMATS, EXPORT_WIDTH, EXPORT_SCALE,
                   agent_colors, label, labels, toy_colors, short_labels, TICK_LINE, tick_label, WRAP_UP_TO,
                   agent_ticks, agent_axis, agent_names, wrap, LEGEND_LINE, Y_TITLE_LINE, LEGEND, eps_label, pct,
                   decades, decade_text, log_ticks, LAMBDA_FLOOR, lambda_top, error_bars)  # noqa: F401
from .heterogeneity import (density_bars, overlap_stacked, unique_vs_chance_bars, layer_module_heatmaps,
                            unique_share_lines, eps_curve, group_lines, norms_conflicts)  # noqa: F401
from .agreement import (pair_matrix, ENERGY_PARTS, energy_profile, agreement_by_group,  # noqa: F401
                        PAIR_LINES_UP_TO)
from .experts import tower_bars, expert_heatmaps, expert_owner_map  # noqa: F401
from .tune import (wants_log_rho, lambda_curve, retention_bars, compare_bars, measured_bars)  # noqa: F401
from .dilution import (toy_heatmaps, table1_bars, fig3_bars, reward_curves)  # noqa: F401
from .sweep import (METHOD_SHORT, PARAM_SHORT, short_text, short_candidate_labels, short_candidate,
                    sweep_param_lines, sweep_time_scatter, sweep_task_bars)  # noqa: F401
from .render import (theme, export_name, PAGE_WIDTH, TITLE_PX, SUBTITLE_PX, styled, SUBTITLE_NAMES, subtitle_of,
                     show, chart_px, pair, beside)  # noqa: F401
from .layout import fit, panels, side_by_side, text_px, MIN_FONT, PAIR_PX  # noqa: F401
