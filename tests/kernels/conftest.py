"""Both builds of the kernels (`danube.kernels.loaded`): the modules that mark themselves with
`pytest.mark.usefixtures("kernel_build")` run every test once over numba's JIT and once over
the ahead-of-time module, which is skipped (saying why) only when it is not built or not current
(scripts/bootstrap.sh builds it wherever a C compiler and Python's headers are)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from danube.kernels import loaded

AOT, AOT_MISSING = loaded.load_aot()


@pytest.fixture(scope="module", params=["jit", "aot"])
def kernel_build(request: pytest.FixtureRequest) -> Iterator[str]:
    """Module-scoped (hypothesis refuses function-scoped fixtures): swaps the kernels every
    entry point calls for the module's tests, and puts back the process's choice after."""
    if request.param == "aot":
        if AOT is None:
            pytest.skip(AOT_MISSING)
        build = AOT
    else:
        build = loaded.load_jit()
    saved = loaded.ACTIVE
    loaded.ACTIVE = build
    yield request.param
    loaded.ACTIVE = saved
