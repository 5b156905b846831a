# Runs once in the template's VM, before its snapshot: the imports a data-science program
# makes are then already done in every execution (templates/python-data/README.md).
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy
import scipy.linalg
import scipy.optimize
import scipy.stats
import sklearn
import sklearn.linear_model
import sklearn.model_selection
import sklearn.preprocessing

import io

# The first chart builds matplotlib's font cache and loads the renderer's code, pandas'
# plotting included; the first HTML table loads pandas' formatters.
frame = pd.DataFrame({"x": [1, 2, 3], "y": [3, 1, 2]})
axes = frame.plot(x="x", y="y", title="warm-up")
axes.figure.savefig(io.BytesIO(), format="png", bbox_inches="tight")
axes.figure.savefig(io.BytesIO(), format="svg", bbox_inches="tight")
plt.close("all")
frame.to_html()
frame.describe()
del frame, axes
