"""How wide the page's main column is, in px: measured in the browser by a tiny component (a ResizeObserver on
Streamlit's main block, reported when it changes by more than a step), kept for the session, so charts and pairs of
charts are laid out for the width they get (`app.charts.layout`). Until the browser has said (the session's first
run, or no browser at all), the narrowest supported layout is assumed: a 1000 px window with the sidebar open —
a layout made for it stays readable when drawn wider."""
from __future__ import annotations

import streamlit as st

FALLBACK_PX = 540  # the main column's content width in a 1000 px window with the sidebar open
MIN_PX, MAX_PX = 280, 4000  # a reported width is clamped to this range (a value from the browser: untrusted)
STEP_PX = 16  # a change smaller than this is not reported (no rerun for a scrollbar appearing)
KEY = "_viewport"  # the component's key
WIDTH_KEY = "_content_px"  # the last width the browser reported, kept when the component's state is not
CSS = f".st-key-{KEY}{{display:none}}"  # the component draws nothing; its element takes no room either

# The last width sent is kept on the window for 10 s, shared by every mount of the component in this tab, and while
# it is that recent a new measurement is compared with it rather than with the width the mount was given (which lags
# a report until the run it starts mounts the component again): the page's height changing as its charts draw fires
# the observer, and without this the same width was sent again and restarted the page's run (and a report sent just
# after a click on another page's link brings the old page back). After 10 s a server that still does not know (a
# new session in the same tab) is told again. For 2 s after a click on a link to another
# page nothing is sent (it is measured again then): a report sent meanwhile names the old page, and its rerun could
# take the user back there.
_JS = """
export default function(component) {
  const { setStateValue, data } = component;
  const main = document.querySelector('[data-testid="stMainBlockContainer"]');
  if (!main) return;
  // One measuring instance per tab, the newest: every run mounts the component again without always tearing the
  // previous mount down, and an older mount still listening reports with the width it knew then (measured: after
  // eight runs one resize was sent eight times, each starting the page's run again).
  if (window.__ramStudioViewportStop) window.__ramStudioViewportStop();
  let timer = null;
  if (!window.__ramStudioNavWatch) {  // a click on a link to another page of the app, noted once per tab
    window.__ramStudioNavWatch = true;
    document.addEventListener('click', (e) => {
      const a = e.target && e.target.closest ? e.target.closest('a[href]') : null;
      if (a && a.origin === location.origin) window.__ramStudioNavAt = Date.now();
    }, true);
  }
  const measure = () => {
    const sinceNav = Date.now() - (window.__ramStudioNavAt || 0);
    if (sinceNav < 2000) { clearTimeout(timer); timer = setTimeout(measure, 2000 - sinceNav); return; }
    const cs = getComputedStyle(main);
    const w = Math.round(main.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight));
    const sent = window.__ramStudioWidth;
    const known = sent && Date.now() - sent.at < 10000 ? sent.w : (data && data.known);
    if (w > 0 && (!known || Math.abs(w - known) >= data.step)) {
      window.__ramStudioWidth = { w: w, at: Date.now() };
      setStateValue('width', w);
    }
  };
  const observer = new ResizeObserver(() => { clearTimeout(timer); timer = setTimeout(measure, 150); });
  observer.observe(main);
  measure();
  // The system's light/dark switching: Streamlit recolours the page at once but the charts keep the theme of the
  // run that drew them; a rerun (once the page has its new colours, which the run reads) draws them again.
  // The scheme last reported is kept on the window: a switch can come while no mount listens (Streamlit mounts the
  // component again when the page recolours), and the mount after it reports the switch.
  const media = window.matchMedia('(prefers-color-scheme: dark)');
  const current = () => (media.matches ? 'dark' : 'light');
  let scheme = null;
  const recolour = () => { clearTimeout(scheme);
    scheme = setTimeout(() => { window.__ramStudioScheme = current(); setStateValue('scheme', current()); }, 300); };
  media.addEventListener('change', recolour);
  if (!window.__ramStudioScheme) window.__ramStudioScheme = current();
  else if (window.__ramStudioScheme !== current()) recolour();
  const stop = () => { observer.disconnect(); clearTimeout(timer); clearTimeout(scheme);
    media.removeEventListener('change', recolour);
    if (window.__ramStudioViewportStop === stop) window.__ramStudioViewportStop = null; };
  window.__ramStudioViewportStop = stop;
  return stop;
}
"""


@st.cache_resource(show_spinner=False)
def _component():
    """The measuring component, registered once per server (inline JavaScript, nothing fetched)."""
    return st.components.v2.component("ram_studio_viewport", js=_JS)


def measure() -> None:
    """Mount the measuring component (once per run, from app/main.py, hidden) and keep what it reported."""
    known = st.session_state.get(WIDTH_KEY)
    result = _component()(key=KEY, data={"known": known, "step": STEP_PX}, on_width_change=lambda: None,
                          on_scheme_change=lambda: None)
    width = getattr(result, "width", None) if result is not None else None
    if isinstance(width, (int, float)) and width == width:
        st.session_state[WIDTH_KEY] = int(min(MAX_PX, max(MIN_PX, width)))


def content_width() -> int:
    """The main column's content width (px): measured, else FALLBACK_PX."""
    width = st.session_state.get(WIDTH_KEY)
    return int(width) if isinstance(width, int) else FALLBACK_PX


def measured() -> bool:
    """Whether the browser has reported the width in this session."""
    return isinstance(st.session_state.get(WIDTH_KEY), int)
