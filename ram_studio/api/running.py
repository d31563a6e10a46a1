"""What every API call does around its work: fetch missing Hub models first (with progress), and stop at a safe
point on Ctrl-C (the first interrupt asks the engine to stop between chunks, as in the CLI)."""
from __future__ import annotations

from ram_studio.api.progress import Sink, engine


def prefetch(refs: list[str], to: Sink | None, stop=None) -> None:
    """Download the Hub models among `refs` that are not in the Hugging Face cache yet (resumable, checked)."""
    from merging.reading.refs import hub_repos

    hub = hub_repos(list(refs))
    if not hub:
        return
    from merging.reading.hub import download, offline_mode, plan_download

    if offline_mode():
        return  # the call itself then says what is missing from the cache
    plan = plan_download(hub)
    if plan.remaining:
        download(plan, progress=engine(to, "download"), cancel=stop)
