"""The application layer: every operator operation once (`Operations`), the `Operator`
Protocol it and the HTTP client (`remote`) both implement, intake and the views."""
