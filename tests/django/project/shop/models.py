from __future__ import annotations

from django.db import models


class Order(models.Model):
    name: models.CharField[str, str] = models.CharField(max_length=100)
