"""The optional C extension of the native OTLP decoder (everything else is in pyproject.toml).

``agentobs.collect._native_json`` builds each span's attribute JSON (docs/collectors.md, part H). It is
``optional``: where no C compiler or Python headers are found the install goes on without it, and
``otlp_native.py`` builds the same text with Arrow kernels. Build it in place in a checkout:
``python setup.py build_ext --inplace`` (``pip install -e .`` does the same).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "agentobs.collect._native_json",
            ["agentobs/collect/_native_json.c"],
            extra_compile_args=["-Wall", "-Wextra"],
            optional=True,
        )
    ]
)
