"""The bake, conducted: rounds of a driver under the compile monitor until nothing new compiles
(``rounds``), ``cachebake build`` around them (``build``: preflight, rounds, pack), the seed and
cross-target preparation of a bake (``seed``), and ``cachebake verify`` (``verify``: one round
against an installed cache, as a server would run it).
"""
