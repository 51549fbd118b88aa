"""Where the embedded server keeps its data: the same from any directory of a project."""

from __future__ import annotations

from pathlib import Path

from pgq_supervisor.embedded import project_data_dir


def test_every_directory_of_a_project_shares_its_roots_data_dir(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'app'\n")
    deep = tmp_path / "src" / "app" / "jobs"
    deep.mkdir(parents=True)
    want = tmp_path.resolve() / ".pgq" / "pgdata"
    assert project_data_dir(tmp_path, env={}) == want
    assert project_data_dir(deep, env={}) == want


def test_the_nearest_root_wins_and_a_git_checkout_is_a_root(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    inner = tmp_path / "vendored"
    (inner / ".git").mkdir(parents=True)
    assert project_data_dir(inner / ".git", env={}) == inner.resolve() / ".pgq" / "pgdata"


def test_outside_any_project_the_users_data_directory(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    data_home = tmp_path / "data"
    got = project_data_dir(loose, env={"XDG_DATA_HOME": str(data_home)})
    # unless tmp_path itself lies inside a project (a checkout's tmp dir): then its root's
    if not any(
        (d / m).exists()
        for d in (loose.resolve(), *loose.resolve().parents)
        for m in ("pyproject.toml", "setup.py", "setup.cfg", ".git")
    ):
        assert got == data_home.resolve() / "pgq_supervisor" / "pgdata"
    else:
        assert got.parts[-2:] == (".pgq", "pgdata")


def test_pgq_embedded_dir_names_it_outright(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    env = {"PGQ_EMBEDDED_DIR": str(tmp_path / "elsewhere")}
    assert project_data_dir(tmp_path, env=env) == (tmp_path / "elsewhere").resolve()
