"""The README and docs/: every link resolves inside the repository, and nothing points at what a
reader of the repository cannot open (a machine path, an issue tracker's numbers)."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))


def links(path):
    """The targets of the markdown links and images of a page: [text](target)."""
    return re.findall(r"\]\(([^)\s]+)\)", open(path).read())


def test_every_link_resolves_inside_the_repository():
    broken = []
    for page in PAGES:
        for target in links(page):
            if target.startswith(("http://", "https://", "#")):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not path.startswith(ROOT) or not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert not broken and len(PAGES) > 5


def test_no_page_points_outside_the_repository():
    for page in PAGES:
        text = open(page).read()
        assert not re.search(r"/work/|\.\./shared|\bissue \d+", text), page


def test_the_readme_fits_on_a_few_screens():
    assert len(open(PAGES[0]).read().splitlines()) <= 250
