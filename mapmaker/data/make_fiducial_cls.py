"""Generate the fiducial CMB power spectra committed beside this script.

Run once, by hand, in an environment with CAMB (``pip install camb``); CAMB is
not a runtime dependency of MapCampaign. The output, ``fiducial_cls.txt``,
holds lensed scalar C_l (no tensors) for the Planck 2018 TT,TE,EE+lowE+lensing
best fit, in K^2 (raw C_l, not D_l), for ell = 0 .. 6000.

    python mapmaker/data/make_fiducial_cls.py
"""
from pathlib import Path

import camb
import numpy as np

LMAX = 6000
PARAMS = {"H0": 67.32, "ombh2": 0.02238, "omch2": 0.1201, "mnu": 0.06, "omk": 0.0,
              "tau": 0.0543, "As": 2.1e-9, "ns": 0.9660, "r": 0.0}


def main() -> None:
    pars = camb.set_params(**PARAMS, lmax=LMAX + 200, lens_potential_accuracy=1)
    results = camb.get_results(pars)
    cls = results.get_total_cls(lmax=LMAX, CMB_unit="K", raw_cl=True)  # [ell, (TT, EE, BB, TE)]
    ell = np.arange(LMAX + 1)
    header = (f"Fiducial lensed CMB C_l in K^2 from CAMB {camb.__version__}; parameters {PARAMS}\n"
              "columns: ell TT EE BB TE")
    out = Path(__file__).with_name("fiducial_cls.txt")
    np.savetxt(out, np.column_stack([ell, cls]), fmt=["%d"] + ["%.6e"] * 4, header=header)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
