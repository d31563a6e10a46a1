"""Plotly figure builders (pure: frames in, figures out), the palettes, and `show` (theme, title, downloads),
one module per chart family. Pages use `from app import charts` and `charts.NAME`: every public name is here."""
from __future__ import annotations

from .agreement import ENERGY_PARTS, PAIR_LINES_UP_TO, agreement_by_group, energy_profile, pair_matrix
from .base import (
    AGENT_PALETTE,
    EXPORT_SCALE,
    EXPORT_WIDTH,
    FIG_FORMAT_KEY,
    FIG_FORMATS,
    FONT,
    LAMBDA_FLOOR,
    LEGEND,
    LEGEND_LINE,
    NEUTRAL,
    OVERLAP_COLORS,
    SHARED_COLOR,
    TEMPLATES,
    THEMES,
    TICK_LINE,
    TOY_PALETTE,
    UNIQUE_COLOR,
    UNIQUE_TEXT,
    WRAP_UP_TO,
    Y_TITLE_LINE,
    agent_axis,
    agent_colors,
    agent_names,
    agent_ticks,
    decade_text,
    decades,
    eps_label,
    error_bars,
    label,
    labels,
    lambda_top,
    log_ticks,
    pct,
    short_labels,
    tick_label,
    toy_colors,
    wrap,
)
from .dilution import fig3_bars, reward_curves, table1_bars, toy_heatmaps
from .experts import expert_heatmaps, expert_owner_map, tower_bars
from .heterogeneity import (
    density_bars,
    eps_curve,
    group_lines,
    layer_module_heatmaps,
    norms_conflicts,
    overlap_stacked,
    unique_share_lines,
    unique_vs_chance_bars,
)
from .layout import MIN_FONT, PAIR_PX, fit, panels, side_by_side, text_px
from .render import (
    LIBRARY_CSS,
    PAGE_WIDTH,
    SUBTITLE_NAMES,
    SUBTITLE_PX,
    TITLE_PX,
    beside,
    chart_px,
    export_name,
    load_library,
    pair,
    show,
    styled,
    subtitle_of,
    theme,
)
from .sweep import (
    METHOD_SHORT,
    PARAM_SHORT,
    short_candidate,
    short_candidate_labels,
    short_text,
    sweep_param_lines,
    sweep_task_bars,
    sweep_time_scatter,
)
from .tune import compare_bars, lambda_curve, measured_bars, retention_bars, wants_log_rho

__all__ = [
    # .agreement
    "pair_matrix", "ENERGY_PARTS", "energy_profile", "agreement_by_group", "PAIR_LINES_UP_TO",
    # .base
    "AGENT_PALETTE", "TOY_PALETTE", "OVERLAP_COLORS", "UNIQUE_COLOR", "SHARED_COLOR", "UNIQUE_TEXT", "NEUTRAL", "FONT",
    "THEMES", "TEMPLATES", "FIG_FORMAT_KEY", "FIG_FORMATS", "EXPORT_WIDTH", "EXPORT_SCALE", "agent_colors", "label",
    "labels", "toy_colors", "short_labels", "TICK_LINE", "tick_label", "WRAP_UP_TO", "agent_ticks", "agent_axis",
    "agent_names", "wrap", "LEGEND_LINE", "Y_TITLE_LINE", "LEGEND", "eps_label", "pct", "decades", "decade_text",
    "log_ticks", "LAMBDA_FLOOR", "lambda_top", "error_bars",
    # .dilution
    "toy_heatmaps", "table1_bars", "fig3_bars", "reward_curves",
    # .experts
    "tower_bars", "expert_heatmaps", "expert_owner_map",
    # .heterogeneity
    "density_bars", "overlap_stacked", "unique_vs_chance_bars", "layer_module_heatmaps", "unique_share_lines",
    "eps_curve", "group_lines", "norms_conflicts",
    # .layout
    "fit", "panels", "side_by_side", "text_px", "MIN_FONT", "PAIR_PX",
    # .render
    "LIBRARY_CSS", "load_library", "theme", "export_name", "PAGE_WIDTH", "TITLE_PX", "SUBTITLE_PX", "styled",
    "SUBTITLE_NAMES", "subtitle_of", "show",
    "chart_px", "pair", "beside",
    # .sweep
    "METHOD_SHORT", "PARAM_SHORT", "short_text", "short_candidate_labels", "short_candidate", "sweep_param_lines",
    "sweep_time_scatter", "sweep_task_bars",
    # .tune
    "wants_log_rho", "lambda_curve", "retention_bars", "compare_bars", "measured_bars",
]
